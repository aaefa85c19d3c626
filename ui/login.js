// The login form carries on the dashboard view the browser was sent here from (the `#`
// of a link such as an alert's, `#/conversation/ID`), which the browser keeps across the
// redirect to this page; after the login the proxy sends the browser on to that view.
"use strict";
document.getElementById("view").value = location.hash;
