"""saturn.codegen: kernel emitters and library-call plans (torch-free)."""
