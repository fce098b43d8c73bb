"""The Textual front end of ckptbench: renders what the domain layer measures and sends it commands."""
