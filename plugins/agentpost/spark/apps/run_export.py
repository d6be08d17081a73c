"""spark-submit runs this file: the export job (`agentpost.spark.export`)."""

import sys

from agentpost.spark.apps import run

if __name__ == "__main__":
    sys.exit(run("export"))
