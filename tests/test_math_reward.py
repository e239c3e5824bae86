"""Number extraction, GSM8K answer parsing and the exact-match reward on tricky strings."""

import pytest

from marllm.rewards.math import ExactMatchReward, extract_last_number, numbers_match, parse_gsm8k_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("It costs $1,234.50 in total.", "1234.50"),
        ("We had 1,000,000 visitors", "1000000"),
        ("-7 degrees at night", "-7"),
        ("x = -3.5.", "-3.5"),
        ("She owes -$5", "-5"),
        ("\u221212 is the result", "-12"),
        ("read pages 3-5", "5"),  # a range, not minus five
        ("10-3=7", "7"),
        ("3, 4, 5", "5"),
        ("1,2345", "2345"),  # not a thousands group: two numbers
        ("42.0", "42.0"),
        ("first 12 then 13\nQuestion: what is 99?", "99"),
        ("version 1.2.3", "1.2"),  # "3" continues the same token, it is not a new number
        ("room B12", "12"),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize("text", ["", "no digits here", "a - b = c", "$", "-."])
def test_extract_last_number_none(text):
    assert extract_last_number(text) is None


def test_extract_last_number_rejects_non_text():
    with pytest.raises(TypeError, match="str"):
        extract_last_number(42)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("Total is 1018.\n#### 1,018", "1018"),
        ("#### -3", "-3"),
        ("#### $15", "15"),
        ("#### 2.5\n", "2.5"),
        ("a #### in the text\n#### 9", "9"),  # the last marker counts
    ],
)
def test_parse_gsm8k_answer(answer, expected):
    assert parse_gsm8k_answer(answer) == expected


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("She has 7 apples.", "no '####'"),
        ("#### seven", "'seven'"),
        ("#### 7 apples", "'7 apples'"),
        ("####", "''"),
    ],
)
def test_parse_gsm8k_answer_errors(answer, message):
    with pytest.raises(ValueError, match=message):
        parse_gsm8k_answer(answer)


@pytest.mark.parametrize(
    ("predicted", "truth", "expected"),
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("42.00", "42", True),
        ("42", "42.0", True),
        ("1234", "1,234", True),
        ("$18", "18", True),
        ("-5", "-5", True),
        ("-5", "5", False),
        ("42.5", "42", False),
        ("0.1", "0.10", True),
        (None, "42", False),
        ("forty-two", "42", False),
        ("nan", "42", False),
    ],
)
def test_numbers_match(predicted, truth, expected):
    assert numbers_match(predicted, truth) is expected


def test_numbers_match_bad_truth():
    with pytest.raises(ValueError, match="ground-truth"):
        numbers_match("1", "one")


SAMPLES = [
    {"query": "q0", "question": "q0", "answer": "2 + 2 = 4\n#### 4"},
    {"query": "q1", "question": "q1", "answer": "#### 1,500"},
    {"query": "q2", "question": "q2", "answer": "#### 10"},
    {"query": "q3", "question": "q3", "answer": "#### 3"},
    {"query": "q4", "question": "q4", "answer": "#### 0"},
]


def test_exact_match_reward_scores_last_number():
    responses = [
        " 2 + 2 = 4. The answer is 4.",  # right
        " That makes $1,500.00 in all.",  # right, written differently
        " 10 minus 1 is 9, so 9",  # the last number is what counts: wrong
        "",  # empty: 0
        " none at all",  # no number: 0
    ]
    rewards = ExactMatchReward()(SAMPLES, responses)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert all(type(r) is float for r in rewards)


def test_exact_match_reward_stop_strings():
    response = " 2 + 2 = 4. The answer is 4.\nQuestion: what is 5 + 6?\nAnswer: 11"
    assert ExactMatchReward()(SAMPLES[:1], [response]) == [0.0]
    assert ExactMatchReward(stop_strings=["\nQuestion:"])(SAMPLES[:1], [response]) == [1.0]


def test_exact_match_reward_missing_answer_names_sample():
    samples = [SAMPLES[0], {"query": "q", "question": "q"}]
    with pytest.raises(KeyError, match=r"sample 1 has no 'answer'.*\['query', 'question'\]"):
        ExactMatchReward()(samples, ["4", "4"])


def test_exact_match_reward_bad_answer_names_sample():
    samples = [SAMPLES[0], {"query": "q", "answer": "no marker"}]
    with pytest.raises(ValueError, match="sample 1"):
        ExactMatchReward()(samples, ["4", "4"])


def test_exact_match_reward_length_mismatch():
    with pytest.raises(ValueError, match="2 samples but 1 responses"):
        ExactMatchReward()(SAMPLES[:2], ["4"])


def test_exact_match_reward_bad_stop_strings():
    with pytest.raises(TypeError, match="single str"):
        ExactMatchReward(stop_strings="\nQuestion:")
    with pytest.raises(ValueError, match="non-empty"):
        ExactMatchReward(stop_strings=[""])
