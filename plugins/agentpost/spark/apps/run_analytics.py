import sys

from agentpost.spark.analytics import main

sys.exit(main())
