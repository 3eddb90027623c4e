# Run by the webui when it loads the extension: make sure tokenmerge is installed in its environment.
import launch

if not launch.is_installed("tokenmerge"):
    launch.run_pip("install tokenmerge", "tokenmerge for the tokenmerge extension")
