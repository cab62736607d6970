import sys

from testbed.agent.runner import main

sys.exit(main())
