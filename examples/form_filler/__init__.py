"""The paper's form-filling case study (section 5, appendix E): forms, tape vocabulary,
environment and simulated users. See docs/form_filler.md."""
