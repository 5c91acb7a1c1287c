"""How likely data loss is: an analytic model (`model`) and a failure-and-repair simulation (`simulate`)."""
