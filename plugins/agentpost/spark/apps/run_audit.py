import sys

from agentpost.spark.audit import main

sys.exit(main())
