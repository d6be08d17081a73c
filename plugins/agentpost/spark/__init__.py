"""PySpark jobs over the trail (layer 4): the analytics, the audit and the Parquet export.

Every job reads the store through `source.Snapshot`: JDBC reads partitioned by id range, each
partition in the one Postgres snapshot the driver exported, plus the Parquet export of old
entries where there is one (`archive`). Results go back to Postgres from the driver
(`results`). The jobs run with `spark-submit` (the files in `apps/`, which is what
SparkSubmitOperator submits) or in-process (`agentpost spark ...`), in local mode or on a
cluster, unchanged. Nothing here is imported by the store, the hooks or the plugin: pyspark
is loaded only by the jobs.
"""
