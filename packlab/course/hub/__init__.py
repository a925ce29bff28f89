"""A JupyterHub for a class on one machine (``make hub``), and the live progress board.

For an HPC centre, or as the fallback of a laptop room, the instructor runs one machine
for everyone: ``make hub CLASS_LIST=class.txt`` starts a real JupyterHub (from PyPI, with
configurable-http-proxy from npm) in which

* every attendee on the class list logs in with a password of their own
  (:mod:`~packlab.course.hub.accounts`), instructors as the hub's admins;
* every attendee's JupyterLab starts in their own ``git clone`` of the release, with
  ``mywork/`` made, the dataset in place read-only (the hub runs the small-data mode,
  ``PACKLAB_COUNT=2000``, unless told otherwise), the course's JupyterLab settings, and in
  a sandbox that sees nobody else's work (:mod:`~packlab.course.hub.server`);
* every ``check()`` run is recorded into the hub's ``records/`` folder, which the live
  board at ``/services/board/`` shows to the instructors (:mod:`~packlab.course.hub.board`);
* ``make submit`` in an attendee's terminal hands in into the shared drop folder
  ``dropbox/``, which ``make gradebook CLASS=<hub>/dropbox`` grades;
* each attendee's server runs on a slice of cores of its own (``--cores-per-attendee``, default 2;
  :mod:`packlab.course.hub.slices`), and the hub refuses more servers than it has slices unless told
  to oversubscribe;
* a server nobody used for two and a half hours is stopped (jupyterhub-idle-culler); its files stay.

The hub's folder (default ``hub/`` in the checkout, git-ignored) holds all of it::

    class.txt          the class list, copied here       users/<name>/course   each attendee's copy
    passwords.txt      one password per person (0600)     records/<name>/       their check runs
    accounts.json      the passwords' hashes              dropbox/<name>/       their submissions
    release/           the release repository (pulled)    data/                 the dataset, shared read-only
    hub.json           this hub's settings                jupyterhub_config.py  reads hub.json

A new release for the class: ``make release DEST=hub/release``; attendees ``git pull``
(or ``make update``) in their terminal.

:mod:`~packlab.course.hub.cli` is the command line; :mod:`~packlab.course.hub.config` the
JupyterHub configuration. Only :mod:`~packlab.course.hub.server` imports JupyterHub itself.
"""
