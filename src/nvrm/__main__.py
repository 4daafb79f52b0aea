"""``python -m nvrm ...``: the ``nvrm`` command (what ``torchrun -m nvrm train`` and ``accelerate launch -m nvrm train`` start)."""

import sys

from nvrm.cli.main import main

sys.exit(main())
