"""`zq top`: a pure model (rates from two stats snapshots), a pure view, a thin live loop."""
