"""Suite-wide settings. Hypothesis's deadline and its too-slow health check are timings: on a loaded machine
(CI shares its cores) they fail tests whose property holds; speed is measured by the benchmarks instead."""

from hypothesis import HealthCheck, settings

settings.register_profile("gpufrac", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpufrac")
