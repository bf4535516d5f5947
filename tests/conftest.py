"""Suite-wide settings. Hypothesis's deadline and its too-slow health check are timings: on a loaded machine
(CI shares its cores) they fail tests whose property holds; speed is measured by the benchmarks instead.

Under `make test` the suite inherits make's own variables; a test that runs `make <target>` stands for a person at a
shell, so they go: with MAKELEVEL set, the inner make prints "Entering directory" around what the target prints."""

import os

from hypothesis import HealthCheck, settings

for _make_variable in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
    os.environ.pop(_make_variable, None)

settings.register_profile("gpufrac", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpufrac")
