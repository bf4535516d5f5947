from gpufrac.cli import main

raise SystemExit(main())
