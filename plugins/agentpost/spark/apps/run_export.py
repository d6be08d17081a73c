"""spark-submit runs this file: the export job (`agentpost.spark.export`)."""

import sys

from agentpost.spark.export import main

if __name__ == "__main__":
    sys.exit(main())
