import sys

from ckptbench.cli import main

sys.exit(main())
