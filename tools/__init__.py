"""Development tools of the project (never shipped: the wheel packages only the runtime and the
operator, so nothing here is on the product packages' import path)."""
