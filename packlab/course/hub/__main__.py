"""``python -m packlab.course.hub``: see :mod:`packlab.course.hub.cli`."""

import sys

from packlab.course.hub.cli import main

sys.exit(main())
