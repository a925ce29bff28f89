"""``python -m packlab.course.doctor``: see :mod:`packlab.course.doctor`."""

import sys

from packlab.course.doctor import main

sys.exit(main())
