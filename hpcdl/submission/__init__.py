"""Submissions and lists: what a system submits to a ranking list and what a list maintainer
publishes (docs/rules.md, docs/guide/submissions.md). ``system`` (the description of the
machine), ``manifest`` (SHA-256 checksums), ``archive`` (reading a tar.gz without trusting it),
``package`` (``hpcdl package``),
``check`` (``hpcdl check``), ``site`` and ``pages`` (``hpcdl list-site``). The stage after
``results``: it audits with ``records``, scores with ``results.score`` and draws with
``results.report``."""
