import sys

from pyxtts.cli import main

sys.exit(main())
