from pagebench.cli import main

raise SystemExit(main())
