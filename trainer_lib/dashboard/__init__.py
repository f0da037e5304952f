"""``posttrain dashboard``: a read-only web UI over what the stages write (docs/dashboard.md).

runs.py     finds stage outputs under local folders and storage URLs and reads them tolerantly
web.py      the HTTP server and its JSON API; Plotly from the plotly package, no CDN
dashboard_cli.py  the command
static/     the page and its script

No stage imports this package: the dashboard stays out of the training path.
"""
