"""HTML report of result records (``hpcdl report``): the systems measured, a table of every
record, figures (scaling, step phases, per-rank throughput, power, memory) as PNG files beside
``index.html``, and the records that do not verify. One module per step: ``data`` (records,
audited), ``sweeps`` (the sweeps found or put together), ``plots`` and ``memory`` (each
figure's data), ``figures`` (the drawing), ``page`` (the HTML), ``write`` (the whole)."""

from hpcdl.results.report.write import write_report

__all__ = ["write_report"]
