import sys

from agentpost.spark.export import main

sys.exit(main())
