"""Certificate tooling: dev certificates for `make run` and the tests, and the serving cert the chart rotates."""
