from heartbeat_runner.interfaces.cli import main

raise SystemExit(main())
