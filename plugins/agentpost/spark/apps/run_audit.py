"""spark-submit runs this file: the audit job (`agentpost.spark.audit`)."""

import sys

from agentpost.spark.audit import main

if __name__ == "__main__":
    sys.exit(main())
