module example.invalid/gpufrac-bench-go-noop

go 1.21
