"""``python -m packlab.course.grade``: see :mod:`packlab.course.grade`."""

import sys

from packlab.course.grade.cli import main

sys.exit(main())
