from heartbeat_runner.cli import main

raise SystemExit(main())
