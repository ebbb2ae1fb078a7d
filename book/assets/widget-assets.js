// The widget library (@jupyter-widgets/html-manager, served from _static/widgets/) resolves its
// icon fonts against the page's own folder unless this variable names where its files are, and
// the browser then asks for fonts that do not exist there. They sit beside the library's script.
window.__jupyter_widgets_assets_path__ = new URL("widgets/", document.currentScript.src).href;
