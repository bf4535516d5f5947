/*
 * An NVIDIA driver library of the fake driver root (testkit/fakes/driver_root.py) that gpufrac does not fake: a
 * shared object with the soname the real one has and no functions, so that NVIDIA's toolkit finds, mounts and links
 * it as it would the real one, and whatever calls into it fails loudly (undefined symbol).
 */
