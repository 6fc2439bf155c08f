"""Result records: their schema and typed views, sealing and atomic storage, building a
record from every rank's measurements, reading a results tree, validity and the audit."""
