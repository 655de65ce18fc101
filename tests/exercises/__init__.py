"""Reference solutions and wrong variants of the tutorials' exercises, and helpers to load and grade them."""
