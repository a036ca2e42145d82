import sys

from evalpush.cli import main

sys.exit(main())
