"""``python -m marllm.cli``: the ``marllm`` command (what ``marllm train --nproc`` runs on each rank)."""

import sys

from marllm.cli import main

sys.exit(main())
