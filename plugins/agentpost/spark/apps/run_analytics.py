"""spark-submit runs this file: the analytics job (`agentpost.spark.analytics`)."""

import sys

from agentpost.spark.apps import run

if __name__ == "__main__":
    sys.exit(run("analytics"))
