"""The Postgres foundation under the store and the mark space.

Connections and the translation of database errors (`db`), named queries (`queries`), finding
or starting a server (`server`), getting a migrated database (`bootstrap`), the migration
runner over the top-level ``sql/`` (`migrations`) and ``sql/schema.sql`` (`schema_dump`).

This package imports the protocol layer (errors, the trail's key pads) and third-party
libraries only: `agentpost.store` and `agentpost.marks` both build on it, and neither of them
on the other.
"""
