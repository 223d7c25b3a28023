from dispatcher.cli import main

raise SystemExit(main())
