"""Not a library (the scripts run as files, and setup.cfg installs modeling_angpt alone). This file makes
experiments/ a package for pytest only: its conftest is then imported as `experiments.conftest`, so that collecting
tests/ and experiments/ in one run never puts it in the place of tests/conftest.py, whose names tests import."""
