import sys

from lossless_check.faces.cli import main

sys.exit(main())
