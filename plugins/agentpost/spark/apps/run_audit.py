"""spark-submit runs this file: the audit job (`agentpost.spark.audit`)."""

import sys

from agentpost.spark.apps import run

if __name__ == "__main__":
    sys.exit(run("audit"))
