"""Alembic's environment for the ledger's revisions (`versions/`, one per schema version): they
run on the connection the caller opened, inside the
transaction it holds (`BEGIN IMMEDIATE` on the file, the advisory lock and a transaction on
PostgreSQL), so every process sees the ledger wholly before or wholly after an upgrade."""

from alembic import context

from evalpush.ledger.tables import metadata

context.configure(
    connection=context.config.attributes["connection"],
    target_metadata=metadata,
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
