"""GPU fakes for gpufrac's tests: a fake libnvidia-ml.so.1 and a fake nvidia-cuda-mps-control."""
