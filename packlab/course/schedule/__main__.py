"""``python -m packlab.course.schedule``: see :mod:`packlab.course.schedule`."""

import sys

from packlab.course.schedule import main

sys.exit(main())
