import sys

from infra.demo.cli import main

sys.exit(main())
