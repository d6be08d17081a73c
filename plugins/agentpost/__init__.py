"""agentpost: agent coordination for Apache Airflow over a Postgres envelope store.

Import what you need from the subpackages (``agentpost.store``, ``agentpost.protocol``);
this module stays light so that Airflow can load the plugin quickly.
"""

__version__ = "0.1.0"
