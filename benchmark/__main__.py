from genshift.cli import main

raise SystemExit(main())
