"""The test kit tests, e2e and bench share (testkit <- tests, testkit <- e2e <- bench): the GPU fakes, the
builders of pods, workloads and AdmissionReviews, the agent's fake world. It imports none of them."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
