"""Write the bundled offline form set: 3 training and 3 test made-up companies x 10 forms.

Deterministic (a fixed seed, no LLM): every form is built from a short hand-written spec (its
purpose, the team that processes it, one categorical, one free-text and one date slot) plus
slots shared by all forms (an email, optional notes, sometimes an urgency). Which shared email
slot a form gets and whether its date is required come from the seeded generator. Run
``python examples/form_filler/make_forms.py`` to rewrite ``data/train.json`` and
``data/test.json``; tests check that the files equal what this script makes and validate.
"""

# ruff: noqa: E501  (the form specs below are a data table, one form per few lines)
from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.form_filler.schema import (
    DATA_DIR,
    Company,
    FormSet,
    FunctionSchema,
    ParameterSchema,
    ParametersSchema,
    check_form_set,
)

__all__ = ["COMPANIES", "FormSpec", "build_form", "make_form_set", "write_form_set"]

SEED = 20241015


class FormSpec(NamedTuple):
    """A form in brief: ``name``; ``purpose`` (completes "Use this form to ..."); ``team`` (who
    processes it) and ``days`` (how long it takes); ``choice`` = (slot, what it is,
    [(value, what the value means)], default or None); ``text`` = (slot, what it is, examples);
    ``when`` = (date slot, what the date is)."""

    name: str
    purpose: str
    team: str
    days: int
    choice: tuple[str, str, list[tuple[str, str]], str | None]
    text: tuple[str, str, list[str]]
    when: tuple[str, str]


def _f(name: str, purpose: str, team: str, days: int, choice: Any, text: Any, when: Any) -> FormSpec:
    return FormSpec(name, purpose, team, days, choice, text, when)


# (name, description, split, email domain, forms)
COMPANIES: list[tuple[str, str, str, str, list[FormSpec]]] = [
    ("FlyCorp", "FlyCorp is a made-up passenger airline flying 180 aircraft to 90 cities, with a loyalty "
     "programme called SkyPoints and its own crew training centre.", "train", "flycorp.example", [
        _f("BookBusinessTrip", "book a flight for a business trip", "the Corporate Travel desk", 2,
           ("cabin_class", "the cabin to book", [("economy", "the standard cabin"), ("premium_economy", "more legroom, allowed above 4 hours"), ("business", "flat beds, allowed above 8 hours with approval")], "economy"),
           ("destination_city", "the city the employee flies to", ["Lisbon", "Toronto"]),
           ("departure_date", "the day of the outbound flight")),
        _f("RequestSeatUpgrade", "ask to upgrade a passenger's seat on a booked flight", "Customer Service", 1,
           ("upgrade_type", "how the upgrade is paid", [("points", "paid with SkyPoints"), ("cash", "paid by card at the current fare difference"), ("voucher", "paid with an upgrade voucher")], None),
           ("booking_reference", "the six-character booking code", ["QX7P2L", "ZK4M9R"]),
           ("flight_date", "the day of the flight to upgrade")),
        _f("ReportLostBaggage", "report a checked bag that did not arrive", "Baggage Services", 3,
           ("bag_type", "the kind of bag", [("suitcase", "a hard or soft case with wheels"), ("backpack", "a bag carried on the back"), ("sports_equipment", "skis, golf clubs, bicycles and the like")], None),
           ("bag_tag_number", "the number printed on the bag tag", ["FC123456", "FC987654"]),
           ("arrival_date", "the day the flight landed")),
        _f("RequestCrewShiftSwap", "swap a scheduled duty with another crew member", "Crew Scheduling", 2,
           ("crew_role", "the role of the requester", [("pilot", "captain or first officer"), ("cabin_crew", "flight attendants and pursers"), ("ground_crew", "ramp and gate staff")], None),
           ("colleague_name", "the full name of the colleague taking the shift", ["Dana Whitfield", "Omar Reyes"]),
           ("shift_date", "the day of the duty to swap")),
        _f("OrderCateringChange", "change the meals loaded on a flight", "Inflight Catering", 4,
           ("meal_option", "the meal to load", [("standard", "the regular menu"), ("vegetarian", "no meat or fish"), ("gluten_free", "certified without gluten")], "standard"),
           ("flight_number", "the flight number starting with FC", ["FC210", "FC845"]),
           ("service_date", "the day of the flight")),
        _f("RequestSimulatorSession", "book a session in the flight simulator", "the Crew Training Centre", 5,
           ("simulator_model", "the aircraft the simulator reproduces", [("a320", "the narrow-body fleet"), ("b787", "the long-haul fleet"), ("e190", "the regional fleet")], None),
           ("training_goal", "what the session should practise", ["engine failure on take-off", "crosswind landings"]),
           ("session_date", "the day of the session")),
        _f("ClaimSkyPoints", "claim loyalty points missing from a past flight", "the SkyPoints team", 10,
           ("membership_tier", "the member's current tier", [("blue", "the entry tier"), ("silver", "after 25 flights a year"), ("gold", "after 50 flights a year")], None),
           ("ticket_number", "the 13-digit ticket number", ["1234567890123", "9876543210987"]),
           ("travel_date", "the day of the flight")),
        _f("ReportAircraftDefect", "report a defect found on an aircraft", "Maintenance Control", 1,
           ("severity", "how serious the defect is", [("cosmetic", "no effect on safety"), ("deferred", "can wait for the next check"), ("grounding", "the aircraft cannot fly")], None),
           ("aircraft_registration", "the registration painted on the aircraft", ["FC-ABA", "FC-KLM"]),
           ("found_on_date", "the day the defect was found")),
        _f("RequestPetTransport", "arrange for a pet to travel with a passenger", "Special Assistance", 3,
           ("pet_location", "where the pet travels", [("cabin", "pets under 8 kg in a carrier"), ("hold", "larger pets in a ventilated hold")], "cabin"),
           ("pet_species", "the kind of animal", ["cat", "small dog"]),
           ("travel_date", "the day of the flight")),
        _f("RequestUniformReplacement", "replace a worn or damaged uniform item", "Uniform Stores", 7,
           ("uniform_item", "the item to replace", [("jacket", "the blazer or coat"), ("shirt", "the shirt or blouse"), ("shoes", "the regulation shoes")], None),
           ("uniform_size", "the size of the new item", ["M", "42"]),
           ("needed_by_date", "the day the item is needed")),
    ]),
    ("BigBankCorp", "BigBankCorp is a made-up retail and business bank with 600 branches, a mobile banking "
     "app and a wealth management arm.", "train", "bigbankcorp.example", [
        _f("OpenBusinessAccount", "open a current account for a business client", "Business Onboarding", 5,
           ("account_package", "the account package", [("starter", "no fee, up to 50 payments a month"), ("growth", "a monthly fee, unlimited payments"), ("enterprise", "a relationship manager and treasury tools")], "starter"),
           ("business_name", "the registered name of the business", ["Green Leaf Ltd", "Northwind Bakery"]),
           ("incorporation_date", "the day the business was registered")),
        _f("DisputeCardTransaction", "dispute a card payment the client does not recognise", "Card Disputes", 10,
           ("dispute_reason", "why the payment is disputed", [("fraud", "the client did not make it"), ("duplicate", "charged twice"), ("not_received", "goods or services never arrived")], None),
           ("merchant_name", "the shop or company that charged the card", ["Shopwise", "Metro Fuel"]),
           ("transaction_date", "the day of the payment")),
        _f("RequestMortgageAppointment", "book a meeting with a mortgage adviser", "Mortgage Advice", 2,
           ("meeting_channel", "how to meet", [("branch", "in a branch"), ("video", "a video call"), ("phone", "a phone call")], "video"),
           ("property_city", "the city of the property", ["Leeds", "Bristol"]),
           ("preferred_date", "the day of the meeting")),
        _f("IncreaseCreditLimit", "raise the limit of a credit card", "Credit Risk", 3,
           ("card_product", "the card", [("classic", "the standard card"), ("rewards", "the cashback card"), ("platinum", "the premium card")], None),
           ("requested_limit", "the new limit wanted, in pounds", ["5000", "12000"]),
           ("effective_date", "the day the new limit should apply")),
        _f("OrderReplacementCard", "replace a lost, stolen or damaged card", "Card Services", 5,
           ("replacement_reason", "why the card is replaced", [("lost", "the card cannot be found"), ("stolen", "the card was taken, it is blocked at once"), ("damaged", "the card no longer works")], None),
           ("delivery_address", "where to send the card", ["12 High Street, York", "4 Mill Lane, Bath"]),
           ("last_used_date", "the day the card was last used")),
        _f("SetUpStandingOrder", "set up a regular payment to another account", "Payments Operations", 1,
           ("payment_frequency", "how often to pay", [("weekly", "every week"), ("monthly", "every month on the same day"), ("quarterly", "every three months")], "monthly"),
           ("payee_name", "the name of the person or company paid", ["Oakwood Lettings", "J. Patel"]),
           ("first_payment_date", "the day of the first payment")),
        _f("RequestBankStatement", "get an official statement for a past period", "Customer Records", 3,
           ("statement_format", "the format of the statement", [("pdf", "a file sent by secure message"), ("paper", "a stamped paper copy by post")], "pdf"),
           ("account_number", "the eight-digit account number", ["12345678", "87654321"]),
           ("period_start_date", "the first day the statement covers")),
        _f("ReportBranchIssue", "report a problem at a branch", "Branch Facilities", 4,
           ("issue_category", "the kind of problem", [("cash_machine", "an ATM out of order"), ("accessibility", "a ramp, door or lift problem"), ("cleanliness", "a dirty or untidy branch")], None),
           ("branch_name", "the branch where it happened", ["Leeds Central", "Camden"]),
           ("noticed_on_date", "the day the problem was seen")),
        _f("ApplyForOverdraft", "apply for an arranged overdraft", "Lending Decisions", 2,
           ("overdraft_purpose", "what the overdraft is for", [("emergency", "a short-term buffer"), ("cash_flow", "regular gaps between income and bills"), ("one_off", "a single large expense")], None),
           ("requested_amount", "the overdraft wanted, in pounds", ["500", "1500"]),
           ("start_date", "the day the overdraft should start")),
        _f("BookSafeDepositBox", "rent a safe deposit box in a branch", "Branch Services", 7,
           ("box_size", "the size of the box", [("small", "documents and jewellery"), ("medium", "a few boxes of valuables"), ("large", "bulky items")], "small"),
           ("branch_name", "the branch holding the box", ["Leeds Central", "Camden"]),
           ("rental_start_date", "the first day of the rental")),
    ]),
    ("CoffeeCorp", "CoffeeCorp is a made-up chain of 3000 coffee shops with its own roastery, a loyalty app "
     "and a franchise programme.", "train", "coffeecorp.example", [
        _f("OrderStoreSupplies", "order cups, lids and other supplies for a shop", "Store Supply", 3,
           ("supply_category", "the kind of supplies", [("cups", "paper and reusable cups"), ("food_packaging", "bags and boxes for food"), ("cleaning", "cleaning products")], None),
           ("store_code", "the four-letter code of the shop", ["LDN4", "MAN2"]),
           ("delivery_date", "the day the delivery should arrive")),
        _f("RequestEspressoMachineRepair", "get an espresso machine repaired", "Equipment Maintenance", 1,
           ("fault_type", "what is wrong", [("no_pressure", "the pump does not build pressure"), ("leak", "water is leaking"), ("grinder", "the grinder is jammed")], None),
           ("machine_serial", "the serial number on the machine", ["EM-22841", "EM-10457"]),
           ("fault_date", "the day the fault started")),
        _f("ApplyForFranchise", "apply to open a franchised shop", "Franchise Development", 30,
           ("site_type", "where the shop would be", [("high_street", "a street-front shop"), ("mall", "inside a shopping centre"), ("drive_thru", "a shop with a drive-through lane")], None),
           ("proposed_city", "the city of the shop", ["Glasgow", "Cardiff"]),
           ("target_opening_date", "the day the shop would open")),
        _f("RequestShiftCover", "ask for another barista to cover a shift", "Store Scheduling", 1,
           ("shift_period", "the part of the day", [("opening", "5am to 1pm"), ("closing", "1pm to 9pm"), ("split", "two short shifts")], None),
           ("store_code", "the four-letter code of the shop", ["LDN4", "MAN2"]),
           ("shift_date", "the day of the shift")),
        _f("SubmitMenuSuggestion", "suggest a new drink or food item", "the Menu Innovation team", 14,
           ("menu_section", "where on the menu it goes", [("hot_drinks", "coffee, tea and chocolate"), ("cold_drinks", "iced and blended drinks"), ("bakery", "pastries and cakes")], None),
           ("item_name", "the name of the suggested item", ["Maple Oat Latte", "Cardamom Bun"]),
           ("season_start_date", "the first day it would be sold")),
        _f("ReportFoodSafetyIncident", "report a food safety incident in a shop", "Food Safety", 1,
           ("incident_type", "what happened", [("allergen", "an allergen reached a customer"), ("temperature", "food kept at the wrong temperature"), ("contamination", "a foreign object in food")], None),
           ("store_code", "the four-letter code of the shop", ["LDN4", "MAN2"]),
           ("incident_date", "the day it happened")),
        _f("RequestBeanSamples", "get samples of a new roast", "the Roastery", 5,
           ("roast_level", "the roast", [("light", "fruity and bright"), ("medium", "balanced"), ("dark", "bold and smoky")], "medium"),
           ("tasting_event", "the event the samples are for", ["staff cupping", "customer tasting"]),
           ("needed_by_date", "the day the samples are needed")),
        _f("UpdateLoyaltyAccount", "fix a problem with a customer's loyalty app account", "Loyalty Support", 3,
           ("account_issue", "the problem", [("missing_stars", "purchases not credited"), ("locked", "the account is locked"), ("merge", "two accounts to merge")], None),
           ("member_id", "the member number in the app", ["CC-558201", "CC-100932"]),
           ("purchase_date", "the day of the purchase concerned")),
        _f("BookBaristaTraining", "enrol in a barista training course", "the Coffee Academy", 10,
           ("course_level", "the course", [("foundation", "for new starters"), ("latte_art", "milk texturing and pouring"), ("master", "for shift leaders")], "foundation"),
           ("employee_name", "the full name of the trainee", ["Priya Shah", "Tom Becker"]),
           ("course_date", "the day the course starts")),
        _f("RequestStoreRefit", "ask for a shop's furniture or layout to be renewed", "Store Design", 60,
           ("refit_scope", "how much is renewed", [("furniture", "tables and chairs only"), ("counter", "the service counter"), ("full", "the whole shop")], None),
           ("store_code", "the four-letter code of the shop", ["LDN4", "MAN2"]),
           ("preferred_start_date", "the day work could start")),
    ]),
    ("DriveCorp", "DriveCorp is a made-up car maker with four models, a dealer network and a car-sharing "
     "service in twelve cities.", "test", "drivecorp.example", [
        _f("BookTestDrive", "book a test drive at a dealership", "Dealer Sales", 2,
           ("car_model", "the model to drive", [("city", "the small electric hatchback"), ("tourer", "the family estate"), ("trail", "the four-wheel-drive SUV")], None),
           ("dealership", "the dealership to visit", ["DriveCorp Leeds", "DriveCorp Croydon"]),
           ("test_drive_date", "the day of the drive")),
        _f("ScheduleCarService", "book a car in for servicing", "Aftersales Service", 3,
           ("service_type", "the kind of service", [("interim", "an oil and safety check"), ("full", "the yearly service"), ("major", "the full service plus belts and fluids")], "full"),
           ("vehicle_registration", "the number plate", ["AB12 CDE", "XY70 ZZT"]),
           ("service_date", "the day to bring the car in")),
        _f("ReportRecallConcern", "report a fault that may need a safety recall", "Product Safety", 5,
           ("affected_system", "the part of the car", [("brakes", "braking"), ("airbags", "airbags and seat belts"), ("battery", "the high-voltage battery")], None),
           ("vin", "the 17-character vehicle identification number", ["WDC12345678901234", "SAL98765432109876"]),
           ("noticed_on_date", "the day the fault was noticed")),
        _f("OrderSparePart", "order a spare part for a customer's car", "Parts Logistics", 4,
           ("shipping_speed", "how fast to ship", [("standard", "within five days"), ("express", "next working day, extra fee")], "standard"),
           ("part_number", "the catalogue number of the part", ["DC-4471-B", "DC-1290-A"]),
           ("needed_by_date", "the day the part is needed")),
        _f("RequestCarShareMembership", "join the car-sharing service", "Car Share Operations", 2,
           ("membership_plan", "the plan", [("pay_as_you_go", "no monthly fee, higher rates"), ("monthly", "a monthly fee, lower rates"), ("business", "billed to an employer")], "pay_as_you_go"),
           ("driving_licence_number", "the number on the licence", ["MORGA753116SM9IJ", "SMITH802134JD5AB"]),
           ("membership_start_date", "the first day of membership")),
        _f("ClaimWarrantyRepair", "claim a repair under the car's warranty", "Warranty Claims", 10,
           ("warranty_type", "which warranty covers it", [("manufacturer", "the first three years"), ("extended", "a bought extension"), ("battery", "eight years on the battery")], None),
           ("fault_description", "what went wrong", ["infotainment screen stays black", "rear window will not close"]),
           ("repair_date", "the day the car was repaired")),
        _f("BookChargerInstallation", "install a home charger for an electric car", "Home Energy", 14,
           ("charger_power", "the charger's power", [("7kw", "a full charge overnight"), ("22kw", "faster, needs three-phase supply")], "7kw"),
           ("property_postcode", "the postcode of the home", ["LS1 4AP", "CR0 2RB"]),
           ("installation_date", "the day of installation")),
        _f("RequestFleetQuote", "get a price for cars for a company fleet", "Fleet Sales", 5,
           ("lease_length", "the lease length", [("two_years", "24 months"), ("three_years", "36 months"), ("four_years", "48 months")], "three_years"),
           ("company_name", "the company leasing the cars", ["Apex Couriers", "Harbour Foods"]),
           ("delivery_date", "the day the cars are wanted")),
        _f("ReportCarShareDamage", "report damage found on a shared car", "Car Share Operations", 1,
           ("damage_area", "where the damage is", [("exterior", "the body or lights"), ("interior", "seats or dashboard"), ("tyres", "a tyre or wheel")], None),
           ("car_share_plate", "the plate of the shared car", ["CS21 DRV", "CS22 KMT"]),
           ("trip_date", "the day of the trip")),
        _f("RequestDealerTraining", "enrol dealer staff in a product course", "Dealer Academy", 21,
           ("training_track", "the course", [("sales", "selling the range"), ("technician", "servicing electric cars"), ("finance", "finance and leasing products")], None),
           ("trainee_name", "the trainee's full name", ["Lena Fischer", "Raj Malhotra"]),
           ("course_date", "the first day of the course")),
    ]),
    ("LuxuryCorp", "LuxuryCorp is a made-up fashion house selling handbags, watches and couture through "
     "flagship boutiques and private appointments.", "test", "luxurycorp.example", [
        _f("BookPrivateAppointment", "book a private appointment in a boutique", "Client Relations", 2,
           ("appointment_type", "the appointment", [("styling", "a personal stylist session"), ("bridal", "couture for a wedding"), ("watches", "a watch specialist")], None),
           ("boutique", "the boutique to visit", ["Paris Flagship", "Milan Via Monte"]),
           ("appointment_date", "the day of the appointment")),
        _f("RequestBagRepair", "send a handbag to the atelier for repair", "the Atelier", 30,
           ("repair_type", "the repair", [("stitching", "seams and handles"), ("hardware", "clasps and zips"), ("leather", "scratches and colour")], None),
           ("product_serial", "the serial number inside the bag", ["LX-88123", "LX-40277"]),
           ("purchase_date", "the day the bag was bought")),
        _f("ReserveLimitedEdition", "reserve an item from a limited collection", "Clienteling", 5,
           ("collection", "the collection", [("spring", "the spring capsule"), ("heritage", "reissued archive pieces"), ("collab", "the artist collaboration")], None),
           ("item_name", "the name of the item", ["Aurelia tote", "Meridian watch"]),
           ("pickup_date", "the day to collect it")),
        _f("RequestEngraving", "add an engraving to a product", "the Atelier", 7,
           ("engraving_font", "the lettering", [("script", "joined handwriting style"), ("roman", "classic capitals"), ("block", "plain modern letters")], "roman"),
           ("engraving_text", "the text to engrave, up to 12 characters", ["A & M", "J.L. 2025"]),
           ("ready_by_date", "the day it must be ready")),
        _f("ArrangeWatchServicing", "have a watch serviced", "Horology Service", 45,
           ("service_level", "the service", [("check", "a check and a clean"), ("full", "a full movement overhaul"), ("polish", "case and bracelet polishing")], "check"),
           ("watch_reference", "the reference number on the case back", ["MW-3100", "AU-0977"]),
           ("drop_off_date", "the day to leave the watch")),
        _f("RequestAuthenticityCertificate", "get a certificate of authenticity", "Brand Protection", 20,
           ("product_category", "the kind of product", [("handbag", "bags and small leather goods"), ("watch", "watches"), ("jewellery", "rings, necklaces and bracelets")], None),
           ("product_serial", "the product's serial number", ["LX-88123", "LX-40277"]),
           ("purchase_date", "the day it was bought")),
        _f("BookFashionShowSeat", "ask for a seat at a fashion show", "Events", 10,
           ("seat_category", "where to sit", [("front_row", "for top clients and press"), ("standard", "the main seating"), ("standing", "standing area")], "standard"),
           ("guest_name", "the guest's full name", ["Camille Roux", "Hugo Lindqvist"]),
           ("show_date", "the day of the show")),
        _f("ReturnOnlinePurchase", "return an item bought online", "Online Client Care", 14,
           ("refund_method", "how to refund", [("original_payment", "back to the card used"), ("store_credit", "credit for a future purchase"), ("exchange", "another size or colour")], "original_payment"),
           ("order_number", "the online order number", ["LC-2024-5531", "LC-2025-0098"]),
           ("delivery_date", "the day the order arrived")),
        _f("RequestBespokeFitting", "book a fitting for a made-to-measure garment", "Couture Atelier", 14,
           ("garment", "the garment", [("suit", "a two-piece suit"), ("gown", "an evening gown"), ("coat", "a tailored coat")], None),
           ("fabric_preference", "the fabric wanted", ["navy wool", "ivory silk"]),
           ("fitting_date", "the day of the fitting")),
        _f("ReportCounterfeitListing", "report a website selling fake products", "Brand Protection", 5,
           ("marketplace_type", "where the listing is", [("marketplace", "a large online marketplace"), ("social", "a social media shop"), ("website", "a standalone website")], None),
           ("listing_url", "the address of the listing", ["shop.example.net/item/4411", "fakes.example.org/bag"]),
           ("seen_on_date", "the day the listing was seen")),
    ]),
    ("ShopCorp", "ShopCorp is a made-up online marketplace with its own warehouses, a seller programme and "
     "a same-day delivery service in large cities.", "test", "shopcorp.example", [
        _f("CreateDigitalCoupon", "create a discount coupon for a seller's online store", "Seller Marketing", 1,
           ("discount_type", "the kind of discount", [("percentage", "a share off the price"), ("fixed_amount", "a set amount off"), ("free_shipping", "no delivery fee")], None),
           ("coupon_code", "the code buyers type", ["SPRING10", "WELCOME5"]),
           ("expiry_date", "the last day the coupon works")),
        _f("RequestReturnLabel", "get a prepaid label to return a parcel", "Returns Centre", 1,
           ("return_reason", "why the item goes back", [("wrong_size", "it does not fit"), ("defective", "it is broken"), ("changed_mind", "no longer wanted")], None),
           ("order_number", "the order number", ["SC-1002934", "SC-7781200"]),
           ("delivery_date", "the day the order arrived")),
        _f("RegisterSellerAccount", "register as a seller on the marketplace", "Seller Onboarding", 5,
           ("seller_plan", "the plan", [("individual", "a fee per item sold"), ("professional", "a monthly fee, no per-item fee")], "individual"),
           ("store_name", "the name shown to buyers", ["Handmade by Ines", "Gadget Barn"]),
           ("launch_date", "the day the store should open")),
        _f("BookSameDayDelivery", "book a same-day delivery slot", "City Logistics", 1,
           ("delivery_window", "the time window", [("morning", "8am to noon"), ("afternoon", "noon to 5pm"), ("evening", "5pm to 10pm")], None),
           ("delivery_address", "where to deliver", ["21 Baker Road, Leeds", "8 Quay Street, Bristol"]),
           ("delivery_date", "the day of the delivery")),
        _f("ReportWarehouseIncident", "report a safety incident in a warehouse", "Warehouse Safety", 1,
           ("incident_severity", "how serious it was", [("near_miss", "nobody was hurt"), ("minor_injury", "first aid was enough"), ("major_injury", "hospital treatment was needed")], None),
           ("warehouse_site", "the warehouse", ["Doncaster DC1", "Milton Keynes DC3"]),
           ("incident_date", "the day of the incident")),
        _f("RequestProductListingReview", "ask for a blocked product listing to be reviewed", "Catalogue Quality", 3,
           ("block_reason", "why it was blocked", [("images", "the photos broke the rules"), ("restricted", "the item is restricted"), ("pricing", "the price looked wrong")], None),
           ("listing_id", "the id of the listing", ["LST-55012", "LST-90877"]),
           ("blocked_on_date", "the day it was blocked")),
        _f("ApplyForPrimeSubscriptionRefund", "get a refund for an unused membership", "Membership Billing", 5,
           ("membership_type", "the membership", [("monthly", "billed every month"), ("annual", "billed once a year"), ("student", "the discounted student plan")], None),
           ("account_holder_name", "the name on the account", ["Ana Costa", "Leo Brandt"]),
           ("charge_date", "the day of the charge")),
        _f("SchedulePickupFromSeller", "have a courier collect parcels from a seller", "Seller Logistics", 2,
           ("parcel_volume", "how many parcels", [("few", "up to 10 parcels"), ("many", "11 to 50 parcels"), ("pallet", "a full pallet")], "few"),
           ("pickup_address", "where to collect", ["Unit 4, Riverside Park, Hull", "9 Station Yard, Derby"]),
           ("pickup_date", "the day of collection")),
        _f("ReportDamagedDelivery", "report a parcel that arrived damaged", "Customer Care", 2,
           ("damage_extent", "how bad the damage is", [("packaging", "only the box"), ("partial", "some items broken"), ("total", "everything is broken")], None),
           ("order_number", "the order number", ["SC-1002934", "SC-7781200"]),
           ("delivery_date", "the day it arrived")),
        _f("RequestGiftWrapping", "add gift wrapping to an order", "Fulfilment", 1,
           ("wrap_style", "the wrapping", [("classic", "brown paper and twine"), ("festive", "seasonal paper"), ("premium", "a box with a ribbon, extra fee")], "classic"),
           ("gift_message", "the note in the parcel", ["Happy birthday, Sam!", "Congratulations!"]),
           ("ship_date", "the day the order ships")),
    ]),
]

_EMAILS = [
    ("requester_email", "the work email of the person making the request", True),
    ("contact_email", "an email address for updates about the request", False),
    ("manager_email", "the email of the manager who approves the request", True),
]
_URGENCY = [("standard", "handled in the usual time"), ("urgent", "handled first, for blocking problems")]


def _sentence(values: list[tuple[str, str]]) -> str:
    return "; ".join(f"choose {v} for {gloss}" for v, gloss in values)


def build_form(spec: FormSpec, company: str, domain: str, rng: random.Random) -> FunctionSchema:
    """The schema of one form: the spec's slots plus shared email, notes and (sometimes)
    urgency slots, with a description that explains the rules and every categorical choice."""
    cat_name, cat_what, values, default = spec.choice
    text_name, text_what, text_examples = spec.text
    date_name, date_what = spec.when
    email_name, email_what, email_required = _EMAILS[rng.randrange(len(_EMAILS))]
    date_required = rng.random() < 0.6
    with_urgency = rng.random() < 0.5
    people = ["alex.morgan", "sam.taylor", "jo.lee", "chris.ng"]
    day = f"2025-{rng.randrange(3, 12):02d}-{rng.randrange(1, 28):02d}"
    props = {
        cat_name: ParameterSchema(
            description=f"{cat_what.capitalize()}; {_sentence(values)}", enum=[v for v, _ in values], default=default
        ),
        text_name: ParameterSchema(description=text_what.capitalize(), examples=text_examples),
        date_name: ParameterSchema(description=f"{date_what.capitalize()}, as YYYY-MM-DD", format="date", examples=[day]),
        email_name: ParameterSchema(
            description=email_what.capitalize(), format="email", examples=[f"{rng.choice(people)}@{domain}"]
        ),
    }
    if with_urgency:
        props["urgency"] = ParameterSchema(
            description=f"How fast the request is handled; {_sentence(_URGENCY)}",
            enum=[v for v, _ in _URGENCY],
            default="standard",
        )
    props["additional_notes"] = ParameterSchema(description="Anything else the team should know")
    required = [n for n in (cat_name if default is None else None, text_name, email_name if email_required else None,
                            date_name if date_required else None) if n]
    description = (
        f"Use this form to {spec.purpose} at {company}. Requests are processed by {spec.team}, "
        f"usually within {spec.days} business day{'s' if spec.days > 1 else ''}. "
        f"For {cat_name.replace('_', ' ')}, {_sentence(values)}."
        + (f" If not given, {cat_name.replace('_', ' ')} is {default}." if default else "")
        + " Optional fields can be skipped."
    )
    return FunctionSchema(
        name=spec.name,
        description=description,
        parameters=ParametersSchema(properties=props, required=required),
        return_value={
            "type": "object",
            "properties": {
                "request_id": {"type": "string", "description": "The reference of the submitted request"},
                "status": {"type": "string", "enum": ["submitted", "queued_for_review"]},
                "handled_by": {
                    "type": "object",
                    "properties": {"team": {"type": "string"}, "expected_days": {"type": "integer"}},
                },
            },
            "required": ["request_id", "status"],
        },
    )


def make_form_set(seed: int = SEED) -> FormSet:
    """The bundled companies and forms, deterministically from ``seed``."""
    rng = random.Random(seed)
    splits: dict[str, list[Company]] = {"train": [], "test": []}
    for name, description, split, domain, specs in COMPANIES:
        forms = [build_form(spec, name, domain, rng) for spec in specs]
        splits[split].append(Company(name=name, description=description, forms=forms))
    return FormSet(**splits)


def form_set_json(forms: FormSet) -> dict[str, str]:
    """The text of ``train.json`` and ``test.json`` for ``forms``."""
    out = {}
    for split in ("train", "test"):
        companies = [c.model_dump(mode="json", exclude_none=True) for c in getattr(forms, split)]
        out[split] = json.dumps({"split": split, "companies": companies}, indent=1, ensure_ascii=False) + "\n"
    return out


def write_form_set(directory: Path = DATA_DIR, seed: int = SEED) -> FormSet:
    """Build, validate (``ValueError`` listing the problems) and write the bundled form set."""
    forms = make_form_set(seed)
    problems = check_form_set(forms, forms_per_company=10, all_kinds=True)
    if problems:
        raise ValueError("the generated form set is invalid:\n" + "\n".join(problems))
    directory.mkdir(parents=True, exist_ok=True)
    for split, text in form_set_json(forms).items():
        (directory / f"{split}.json").write_text(text, encoding="utf-8")
    return forms


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="folder for train.json and test.json")
    written = write_form_set(parser.parse_args().out)
    for company in [*written.train, *written.test]:
        print(f"{company.name}: {len(company.forms)} forms")
