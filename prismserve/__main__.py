from prismserve.cli import main

raise SystemExit(main())
