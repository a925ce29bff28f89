"""``python -m packlab.course.benchmark``: what ``make bench`` runs."""

from packlab.course.benchmark.suite import main

raise SystemExit(main())
