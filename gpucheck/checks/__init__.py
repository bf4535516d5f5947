"""The checks, one module per group of rows; gpucheck.run orders them."""
