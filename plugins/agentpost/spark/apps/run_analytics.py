"""spark-submit runs this file: the analytics job (`agentpost.spark.analytics`)."""

import sys

from agentpost.spark.analytics import main

if __name__ == "__main__":
    sys.exit(main())
