from fissure.cli import main

raise SystemExit(main())
